"""Strom's web console: a separate process built on Strom's client, so it serves any Kafka-protocol
cluster (Strom, Apache Kafka, Redpanda, Tansu).

``strom console --bootstrap-server HOST:PORT`` serves it (``strom.cli.console``). Pages are
rendered on the server with Jinja2; a little JavaScript (``static/console.js``) refreshes the
parts of a page marked live and streams long work (a search) without reloading the page.
"""
