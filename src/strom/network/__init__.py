"""The network core shared by Strom's clients and, for replication, its brokers.

Client-side connections to Kafka-protocol brokers: framing and correlation of
pipelined requests, ApiVersions negotiation, and a pool that reconnects with backoff.
Messages come from ``strom.protocol``; nothing here knows about producers or consumers.
"""
