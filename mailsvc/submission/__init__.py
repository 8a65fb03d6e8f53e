"""SMTP submission: a door into the same service for software that only speaks SMTP.

``mailsvc submission`` serves it (:mod:`.server`), on aiosmtpd: AUTH with an API key as the
password, then each message becomes an email of the API under the API's own rules
(:mod:`.transactions`, :mod:`.mime`), answered in SMTP's terms (:mod:`.replies`), each
connection bounded in bytes and time (:mod:`.session`).
"""
