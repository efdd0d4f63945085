"""Seeing what the methods do: run reports and plots, pivot analysis."""
