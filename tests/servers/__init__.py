"""Real inference servers for the remote-engine tests: built by build.sh, started by harness.py."""
