"""What all four operators share: the access layer, the process set-up, metrics, conventions and the
controller toolkit."""
