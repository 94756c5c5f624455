"""Integrations of the expert MLP into training frameworks, one module per framework.

Owns nothing at package level and imports no framework: ``import cudnn_ext`` never loads
this package. Import the framework's module by name, e.g. ``cudnn_ext.integrations.torchtitan``
(needs ``torchtitan``, the ``titan`` extra).
"""
