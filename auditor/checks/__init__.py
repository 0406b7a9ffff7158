"""The audit checks: pure analysis cores and the thin async drivers around them."""
