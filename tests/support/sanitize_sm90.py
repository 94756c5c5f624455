"""One small SM90 case, for compute-sanitizer (memcheck / racecheck) runs on the device:

    PYTHONPATH=.:tests/support compute-sanitizer --tool memcheck python3 tests/support/sanitize_sm90.py MODE

MODE: dense, discrete, discretecl, cluster, cluster2x2, densen, fresh, coop, coop4, split,
walk or chalf.

``discrete`` runs the per-expert pointer variant (N-major, device-built descriptors);
``cluster`` the 2-CTA cluster variant (B multicast); ``cluster2x2`` the 2x2 cluster (A and
B multicast); ``densen`` the cluster variant with dense N-major B; ``fresh`` the cluster variant's
fresh-outputs launch (the functional torch path); ``coop`` the cooperative schedule (tile 256,
2x1 clusters) on enough tiles that every cluster walks two (shared dbias slots reused),
``coop4`` the same with the deep-K form's 4 C stages per warpgroup (3 A/B stages);
``split`` that ring with the last round split along K (knob split_last);
``walk`` the default ping-pong kernel (tile 128, 2x1 clusters, one C stage) on enough tiles
that each math warpgroup walks several, so every C stage and its dbias slice is handed back
across tiles by the C producer warp; ``chalf`` the same walk with 64-row C ring entries
(c_split 2).
"""
import sys

from sm90_cases import Case, run_and_check

if __name__ == "__main__":
    # 2 experts + an empty one, N not a multiple of the tile, K not of 64, dbias on; small
    # enough for the sanitizers (20 tiles: one per CTA, so it does not exercise the walk)
    mode = sys.argv[1] if len(sys.argv) > 1 else "dense"
    if mode == "cluster":
        case = Case([512, 0, 768], 160, 200, "dgeglu", tile_n=128, cluster_m=2)
    elif mode == "cluster2x2":  # A and B multicast; N=160 -> 2 N-tiles of 128, K=200
        case = Case([512, 0, 768], 160, 200, "dgeglu", tile_n=128, cluster_m=2, cluster_n=2)
    elif mode == "densen":
        case = Case([512, 0, 768], 160, 200, "dgeglu", tile_n=128, cluster_m=2, b_major="n")
    elif mode == "discretecl":  # discrete B in 2x1 clusters (multicast through one descriptor)
        case = Case([512, 0, 768], 160, 200, "dgeglu", tile_n=128, weight_mode="discrete",
                    b_major="k", cluster_m=2)
    elif mode == "discrete":
        case = Case([512, 0, 768], 160, 200, "dgeglu", tile_n=128, weight_mode="discrete",
                    b_major="n")
    elif mode == "coop":  # 64 slabs x 2 N-tiles = 128 units over at most 66 clusters
        case = Case([2048] * 8, 480, 136, "dswiglu", tile_n=256, cluster_m=2, cooperative=True,
                    extra_rows=0)
    elif mode == "coop4":  # the engine's deep-K cooperative ring (COOPERATIVE_DEEP_KNOBS)
        case = Case([2048] * 8, 480, 136, "dswiglu", tile_n=256, cluster_m=2, cooperative=True,
                    extra_rows=0, c_stages=4)
    elif mode == "split":  # 50 slabs x 2 N-tiles = 100 units: on 66 clusters 34 left,
        # their 102 k-tiles spread over all 66 (ranges of 1 or 2 k-tiles, units in 2 or 3
        # parts: the partial sums' hand-over through the workspace)
        case = Case([2048] * 6 + [512], 480, 136, "dswiglu", tile_n=256, cluster_m=2,
                    cooperative=True, extra_rows=0, c_stages=4, split_last=3)
    elif mode == "walk":  # 64 slabs x 4 N-tiles = 256 units over at most 66 clusters
        case = Case([2048] * 8, 480, 136, "dswiglu", tile_n=128, cluster_m=2, extra_rows=0)
    elif mode == "chalf":  # the walk with 64-row C ring entries (c_split 2)
        case = Case([2048] * 8, 480, 136, "dswiglu", tile_n=128, cluster_m=2, extra_rows=0,
                    c_split=2)
    elif mode == "fresh":  # the functional path's variant: init kernel + main + assign fold
        case = Case([512, 0, 768], 160, 200, "dgeglu", tile_n=128, cluster_m=2)
    else:
        case = Case([512, 0, 768], 160, 200, "dgeglu", tile_n=128)
    print(run_and_check(case, fresh=mode == "fresh"))
