"""Sphinx settings of gradcomp's Python API reference (python/tests/test_api_reference.py
builds it with warnings as errors)."""

project = "gradcomp for PyTorch"
author = "the gradcomp authors"
extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
html_theme = "alabaster"
exclude_patterns = ["_build"]
