"""Operations: what people and tools use to run and watch appliances.

``cli/`` the ``topicwire`` command, ``mgmt/`` the management HTTP API and metrics,
``telemetry/`` path telemetry and the Spark route job, ``demo.py`` the embedded fabric demo,
``warm.py`` the kernel warm-up that ``make setup`` runs.
"""
