"""The reconcile's I/O edge: the kopf handlers, the work queue, the writes, the scrapes and the metrics server;
what it decides comes from operator/reconcile_plan/ (pure)."""
