"""Packaged preset data (models, clusters); data files only."""
