"""The fixed-order sums of per-tile partials (the deterministic form's dprob and dbias)."""
