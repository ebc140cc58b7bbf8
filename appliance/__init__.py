"""Appliances: core and edge daemons, P&M, the client API and the ``topicwire`` command line."""
