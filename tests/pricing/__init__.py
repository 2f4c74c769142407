"""Tests of the price collectors and parsers."""
