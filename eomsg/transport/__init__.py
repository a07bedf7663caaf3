"""What the sans-IO wire needs from the world to run over a real stream: where a node
is reached (:mod:`eomsg.transport.address`: ``unix://``, ``tcp://``, ``tls://`` and a
data directory's socket and token files) and the TLS contexts a node serves with and a
client trusts, built from files and the environment (:mod:`eomsg.transport.tls`)."""
