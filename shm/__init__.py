"""Deadline Queue: shm package."""
