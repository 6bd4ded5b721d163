"""``ead depth``: entropy-matched adaptive depth (EMAD), one model stopping each token's pass early.

``readout`` (the model's head on a hidden state, in ggml) → ``profile`` (probe layers, buckets, the
stored profile) and ``probes`` (the eval-callback tap, the entropy estimators) → ``model`` (options,
events, the generation loop) → ``corpus`` and ``teacher`` (teacher forcing, calibration, replayed
operating points) → ``evaluate`` (``ead depth eval``: perplexity, HumanEval, verdict, plot). Only the CLI
imports this package; it uses the bench's tasks and sandbox for HumanEval.
"""

CALIBRATION_TOKENS = 1024  # teacher-forced tokens `ead depth calibrate` reads by default
WINDOW = 256  # tokens per teacher-forcing pass (here, for calibrate's help, without loading depth)
