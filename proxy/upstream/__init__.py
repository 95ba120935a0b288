"""The outbound side: the upstream body prepared by the policy, the outgoing URL and headers, the
relay that streams the answer back, and the recording and replay of those calls (proxy layer)."""
