"""H1, the framework floor: a Werkzeug app that reads the body and answers a small JSON."""

from werkzeug.wrappers import Request, Response


@Request.application
def app(request: Request) -> Response:
    request.get_data()
    return Response('{"id": "em_noop", "status": "queued"}', content_type="application/json")
