"""Deadline Queue: pipeline package."""
