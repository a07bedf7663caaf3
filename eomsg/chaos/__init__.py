"""Proving eomsg's promises under faults: histories of what clients did and saw
(:mod:`~eomsg.chaos.history`), and the checker that holds a whole history to those
promises (:mod:`~eomsg.chaos.check`)."""
