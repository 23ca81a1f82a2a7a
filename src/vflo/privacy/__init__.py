"""Attacks on what a party sends, to measure what it leaks."""
