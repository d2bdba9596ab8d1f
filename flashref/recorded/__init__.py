"""Readers of the recorded GPU runs in ``results/``, for the chapters' tables and figures.

* ``kernel_runs``: the forward benchmark and profile (``Bench``, ``Profile``), the one rule for
  whether a step helped (``step_verdict``), and the tables chapters 5 and 7 print;
* ``defaults``: the rule that picks each family's default version from a recorded run;
* ``training``: chapter 8's training run and its step profile; ``backward``: the backward
  benchmark; ``decode`` and ``decode_timing``: chapter 10 and its appendix;
* ``labels``: plot labels that keep their order; ``files``: reading JSON with every field
  checked.

Each module reads files and prints lines; none runs a kernel.
"""
