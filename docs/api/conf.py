"""Sphinx configuration of kvnumba's API reference (built from the docstrings).

Build it with ``python -m sphinx -W --keep-going -b html docs/api docs/_build/api``.
"""

import kvnumba

project = "kvnumba"
author = "the kvnumba maintainers"
release = version = kvnumba.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
html_theme = "alabaster"
exclude_patterns = ["_build"]
