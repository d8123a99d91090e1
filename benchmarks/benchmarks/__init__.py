"""asv benchmarks of kvnumba: one class per block-manager operation (see ``common.py``)."""
