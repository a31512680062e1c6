"""infer_lab: the library behind a hands-on course on LLM inference at scale.

Modules mirror the course notebooks: ``models`` (three model sources), ``hardware`` (what you
have and its measured ceilings), ``harness`` (honest timing), ``analysis`` (memory equation,
roofline, capacity), ``quant``, ``attention`` and ``engine`` (a from-scratch serving engine).
"""

__version__ = "0.1.0"
