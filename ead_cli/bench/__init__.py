"""``ead bench``: run decoding strategies over HumanEval or a prompt list and compare quality, cost and time.

``tasks`` (HumanEval, prompt lists, the prompt format) → ``sandbox`` (running a completion against its
tests) → ``grid`` (which strategies, and their names) → ``results`` (the resumable results file) → ``run``
(the loop) → ``report`` (figures, table, plot). ``native`` runs llama.cpp's own loops in a llama-server as
peers; ``schedule`` records every llama.cpp feed of a sample, which ``replay`` re-executes on other
models; ``speed`` measures each model's per-token cost. Outside the bench only ``depth.evaluate``
(HumanEval's tasks and sandbox) and the CLI's ``calibrate --prompts`` and ``depth eval`` (``tasks``)
import this package.
"""
