"""CuTe DSL kernels of the training layer's elementwise steps (``cudnn_ext.torch.mlp``)."""
