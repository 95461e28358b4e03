"""Datasets: readers for local files and hub ids, format conversion, and the embedded demo data."""
