"""Helpers for the service and browser tests: real servers started and stopped by the test."""
