"""Strom: Apache Kafka's design rebuilt in Python."""

__version__ = "0.1.0"
