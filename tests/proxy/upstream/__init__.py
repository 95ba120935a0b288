"""The upstream layer: pass-through, outgoing URLs and credentials, relay, recording, replay."""
