"""Each client session's flow-control policy, from its subscriptions, its identity and P&M.

Most specific wins: the policy a subscription asks for (``Client.subscribe(...,
flow_policy=)``, the SUBSCRIBE entry's ``SUBSCRIPTION_FLAG_POLICY_MASK`` bits), else its
identity's ``flow_policy`` in P&M's document, else the document's ``flow_policy``, else the
QoS's default (``policy_for_qos``: best-effort drops the oldest, last-value conflates). The
data path holds one queue per session, so a session whose subscriptions have different
policies gets the strictest of them (throttle, then conflate, then drop-oldest).
A configured policy (asked for, or named in P&M) puts the session under flow control from its
first subscription: every message to it goes through its queue and within the credit its
client grants, so a burst never overflows the client's socket. With only the QoS's default,
the session takes the forwarding pipeline until its client first signals "on" (what its
socket could not hold before the appliance heard is lost, and the subscriber counts it as
``lost``). Guaranteed subscriptions travel on the reliable transport, whose own flow control
throttles (datapath/reliability); they are not counted here. docs/flow-control.md.
"""

from __future__ import annotations

from typing import Any

from datapath.flow_control import NAME_OF_POLICY, POLICY_NAMES, policy_for_qos, strictest
from datapath.protocol import admin_layout as al
from datapath.protocol.admin_layout import FlowPolicy
from datapath.protocol.message_layout import Qos


def subscription_policy(session: Any, entry: al.Subscription) -> tuple[FlowPolicy, bool]:
    """The policy of one subscription (most specific wins), and whether it was configured
    (asked for, or named in P&M) rather than the QoS's default."""
    asked = entry.flags & al.SUBSCRIPTION_FLAG_POLICY_MASK
    if asked:
        return FlowPolicy(asked - 1), True
    named = POLICY_NAMES.get(getattr(session.ents, "flow_policy", None) or "")
    if named is not None:
        return named, True
    return policy_for_qos(entry.qos), False


def record(agent: Any, session: Any, entry: al.Subscription, add: bool) -> str | None:
    """After an accepted (un)subscribe of ``session``: keep its subscription's policy and
    tell the data path when the session's policy changes. Returns the policy's name when
    it was configured (the answer tells the client: its queue then counts in its flow
    control), else None."""
    if entry.qos == Qos.GUARANTEED:
        return None
    key = (entry.namespace_id, entry.pattern)
    engage = False
    if add:
        session.flow_policies[key], engage = subscription_policy(session, entry)
    else:
        session.flow_policies.pop(key, None)
    policy = strictest(session.flow_policies.values())
    if policy is not None and (int(policy) != session.flow_policy or engage):
        session.flow_policy = int(policy)
        agent.dp.command("set_flow_policy", session.session_id, int(policy), engage)
        agent.counters[f"flow_policy_{policy.name.lower()}"] += 1
    return NAME_OF_POLICY[session.flow_policies[key]] if add and engage else None
