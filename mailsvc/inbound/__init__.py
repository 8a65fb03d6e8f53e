"""Bounces and complaints coming back: reading them (:mod:`.reports`) and what they change
(:mod:`.processing`)."""
