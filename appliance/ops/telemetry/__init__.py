"""Telemetry and route selection (docs/routing.md).

Appliances measure every path (appliance <- neighbour, per channel) in fixed windows
(``windows``), write them as Parquet to a telemetry store (``store``, ``writer``); a PySpark
job (``routes_job``) merges the windows, prices each path (``costs``) and writes a route
table with best and backup paths per (source, destination), with hysteresis.
"""
