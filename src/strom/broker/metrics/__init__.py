"""The broker's metrics, served at ``metrics.listener`` (``GET /metrics``, Prometheus' text format).

Naming convention -- the one the Prometheus JMX exporter's common Kafka rules give Kafka's JMX
beans, so that the queries and dashboards Kafka users have work unchanged:

* a Kafka bean ``kafka.<domain>:type=<Type>,name=<Name>,<key>=<value>...`` is exported as
  ``kafka_<domain>_<type>_<name>``, lower-cased, its other key properties as labels
  (``kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec,topic=T`` ->
  ``kafka_server_brokertopicmetrics_bytesin_total{topic="T"}``);
* a Meter (``...PerSec``) is a counter: the ``PerSec`` goes, ``_total`` comes;
* a Gauge keeps its name (``kafka_server_replicamanager_underreplicatedpartitions``);
* a Histogram keeps the bean's name and unit and becomes a real Prometheus histogram
  (``kafka_network_requestmetrics_totaltimems_bucket{request="Produce",le="5"}``): request times are
  in milliseconds, as the beans' ``...TimeMs`` names say;
* labels keep Kafka's values: ``request`` is ApiKeys' name ("Produce", "ListOffsets"), ``error``
  Kafka's error name ("NOT_LEADER_OR_FOLLOWER"), ``listener`` the listener's name.

Metrics Kafka has no bean for start with ``strom_`` and follow Prometheus' own conventions (base
units: ``strom_eventloop_lag_seconds``). prometheus_client's process and GC collectors keep their
standard names (``process_resident_memory_bytes``, ``python_gc_collections_total``).

Modules: ``stats`` (what the request path counts, without locks), ``collectors`` (the families,
built at each scrape), ``runtime`` (event-loop lag, GC pauses), ``endpoint`` (the HTTP server),
``service`` (``BrokerMetrics``: the registry, where other collectors register, and the lifecycle),
``lag`` (consumer group lag).
"""
