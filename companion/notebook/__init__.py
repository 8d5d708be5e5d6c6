"""Helpers for the chapter notebooks: the run profile, plots and diagrams, widgets, attention maps."""
