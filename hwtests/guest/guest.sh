#!/bin/sh
# Runs inside the soft-RoCE guest that hwtests/guest/launch.py boots (cwd: the project, seen
# over 9p): make the RDMA devices, then run the command given, with the environment the
# launcher chose. Lines starting "topicwire-guest:" mark progress for the launcher.
set -eu
echo "topicwire-guest: up after $(cut -d' ' -f1 /proc/uptime) s"
sh hwtests/guest/provision.sh --devices
echo "topicwire-guest: soft-RoCE ready after $(cut -d' ' -f1 /proc/uptime) s"
status=0
"$@" || status=$?
echo "topicwire-guest: command exited $status after $(cut -d' ' -f1 /proc/uptime) s"
exit $status
