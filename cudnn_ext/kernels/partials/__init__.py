"""The fixed-order sum of per-tile partials (the deterministic form's dprob)."""
