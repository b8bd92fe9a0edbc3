"""HTML that spotnb shows in a notebook, shielded from the notebook's math typesetter.

JupyterLab runs MathJax over HTML outputs and reads `$…$` as inline TeX, so "$0.10/h × 1.04 h
= $0.1045" came out as italic run-together maths. MathJax skips any element (and its subtree)
carrying its ignore class: `mathjax_ignore` in MathJax 3/4 (JupyterLab 4), `tex2jax_ignore` in
MathJax 2 (classic Notebook, JupyterLab 3). Every HTML root spotnb emits carries both, so a
dollar amount stays a dollar amount whatever front end draws it.
"""

from __future__ import annotations

__all__ = ["NO_MATH"]

#: the classes that make MathJax 2, 3 and 4 leave an element's text alone
NO_MATH = "mathjax_ignore tex2jax_ignore"
