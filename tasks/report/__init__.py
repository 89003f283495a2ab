"""The run report: one self-contained HTML page and the TensorBoard scalars derived from a run folder."""
