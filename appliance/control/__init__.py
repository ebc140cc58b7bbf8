"""The control plane of an appliance: neighbours, link state and paths, subscription interest,
client sessions and entitlements, P&M, authentication of fabric admin frames.

``agent.py`` the control agent, ``routing.py`` link state and path computation,
``route_apply.py`` route tables from P&M, ``pm.py`` the P&M document and entitlements,
``auth.py`` the fabric MAC and replay guard, ``documents.py`` the schema of every CONTROL
document. It talks to the data path only through queues and table snapshots.
"""
