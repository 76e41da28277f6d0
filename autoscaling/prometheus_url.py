"""Where KEDA's prometheus scaler reads from when `conveyor render keda` is told no other, in a
module that imports nothing: `--prometheus-url` shows it as its default, and `conveyor render
--help` (every usage error too) imported the KEDA renderer, Redis and the model repository only
to show it."""

PROMETHEUS_URL = "http://prometheus-server.monitoring.svc"  # the prometheus Helm chart's Service
