"""What a server tells its operators about itself: Prometheus metric families
(``metrics``), the gRPC interceptor that counts and times every call (``rpc``), the probe
of how late the API's event loop runs (``loop_lag``), and the HTTP port that serves them
with the leader and health (``http``).

Counters and histograms are module-level (one ``observe`` per event on the hot path); the
gauges are read from the server's own objects when Prometheus scrapes (``ServerCollector``),
so nothing polls but the loop-lag probe, whose timer is what it measures. Every name
starts ``drover_``; labels are bounded sets (method, entry
type, scheduler type, outcome, peer name), never an ID.
"""
