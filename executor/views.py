"""Provider callbacks (executor.callbacks): thin, unauthenticated by API key (the provider signs instead),
and never an HTML page. The body is bounded by config.limits before it reaches here."""

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from executor import callbacks
from jobs.errors import error_body, method_not_allowed


@csrf_exempt
def provider_callback(request, provider: str):
    if request.method != "POST":
        return method_not_allowed("POST", "Callbacks are POSTed.")
    answer = callbacks.ring(provider, request.body, request.headers)
    if answer.status >= 400:
        return JsonResponse(error_body(answer.code, answer.message), status=answer.status)
    return JsonResponse({"status": answer.code}, status=answer.status)
