"""Every path answers a method that its view does not declare with 405 and `Allow`.

Without this, a plain Django function view answers any method as if it were GET (`TRACE
/healthz` got 200), and a DRF view authenticates before it looks at the method (an anonymous
`PUT /api/jobs/` got 401). `MethodNotAllowedMiddleware` resolves the path first, asks the view
which methods it declares, and refuses the others before any view, authentication or session
code runs, in the API's error shape: `{"code": "method_not_allowed", "detail": ...}`.

What a view declares:
- a DRF viewset route: the methods its router mapped to actions, plus OPTIONS (DRF answers it);
- any other class-based view (DRF's `APIView`, Django's `View`): the handlers it defines;
- a function view: the list given to Django's `require_http_methods` (`require_GET`,
  `require_POST`, `require_safe`), when it is decorated with one;
- any other function view (the admin's): GET, HEAD and POST, what Django's own forms use.
HEAD goes with GET wherever the view answers it as GET (class-based views).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve

# What an undecorated function view serves: pages and forms.
FUNCTION_VIEW_METHODS = frozenset({"GET", "HEAD", "POST"})
# The order methods are listed in `Allow`.
METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _sorted(methods: set[str] | frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted(methods, key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else 99, m)))


def _declared_by_decorator(view: Callable[..., Any]) -> frozenset[str] | None:
    """The methods given to Django's `require_http_methods` somewhere in the view's decorator
    stack (each decorator keeps the next one as `__wrapped__`), or None."""
    func: Any = view
    for _ in range(32):
        code = getattr(func, "__code__", None)
        if code is not None and "request_method_list" in code.co_freevars and func.__closure__:
            cell = func.__closure__[code.co_freevars.index("request_method_list")]
            return frozenset(method.upper() for method in cell.cell_contents)
        func = getattr(func, "__wrapped__", None)
        if func is None:
            return None
    return None


@cache
def view_methods(view: Callable[..., Any]) -> tuple[str, ...]:
    """The methods `view` (a URL pattern's callback) declares, in `Allow` order."""
    cls = getattr(view, "cls", None) or getattr(view, "view_class", None)
    if cls is not None:
        actions = getattr(view, "actions", None)
        if actions:  # a DRF viewset route: only what the router mapped here
            names = {method.lower() for method in actions}
        else:
            names = {name for name in cls.http_method_names if name != "head" and hasattr(cls, name)}
        if "options" in cls.http_method_names and hasattr(cls, "options"):
            names.add("options")
        if "get" in names:
            names.add("head")  # Django's View.setup answers HEAD with the GET handler
        return _sorted({name.upper() for name in names})
    declared = _declared_by_decorator(view)
    return _sorted(declared if declared is not None else FUNCTION_VIEW_METHODS)


def path_methods(path: str, urlconf: str | None = None) -> tuple[str, ...] | None:
    """The methods the view at `path` declares; None when no route matches (a 404 follows)."""
    try:
        match = resolve(path, urlconf)
    except Resolver404:
        return None
    return view_methods(match.func)


def method_not_allowed(request: HttpRequest, allowed: tuple[str, ...]) -> HttpResponse:
    """405 in the API's error shape, with `Allow` (RFC 9110, 15.5.6)."""
    response = JsonResponse(
        {
            "code": "method_not_allowed",
            "detail": f"{request.method} is not allowed on {request.path}; it allows {', '.join(allowed)}.",
        },
        status=405,
    )
    response["Allow"] = ", ".join(allowed)
    return response


class MethodNotAllowedMiddleware:
    """Answers 405 to a method the path's view does not declare (sync and async)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _refusal(self, request: HttpRequest) -> HttpResponse | None:
        allowed = path_methods(request.path_info, getattr(request, "urlconf", None))
        if allowed is None or request.method in allowed:
            return None
        return method_not_allowed(request, allowed)

    def __call__(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        if self.is_async:
            return self._acall(request)
        return self._refusal(request) or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        return self._refusal(request) or await self.get_response(request)
