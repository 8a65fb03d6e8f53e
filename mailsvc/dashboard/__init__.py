"""The dashboard: server-rendered pages for people, in the same WSGI app as the API.

An account signs in with one of its API keys; the browser then holds only a random session id
(sessions live in the store). Every page asks the API's own path (:meth:`MailService.act`) with
the session's key, so it is refused for the same reasons and costs what the API does.
"""
