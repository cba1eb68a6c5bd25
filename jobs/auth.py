"""`Authorization: Bearer <api_key>`: the key's prefix finds its row, the SHA-512 hash verifies it
(djangorestframework-api-key), and the request acts as that key's client."""

from rest_framework import authentication, exceptions

from jobs.models import ClientAPIKey


class BearerAPIKeyAuthentication(authentication.BaseAuthentication):
    keyword = "bearer"

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None  # NotAuthenticated -> 401 with WWW-Authenticate
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != self.keyword or not key or len(key) > 200:
            raise exceptions.AuthenticationFailed("Expected 'Authorization: Bearer <api_key>'.")
        prefix, dot, _ = key.partition(".")
        if not dot:
            raise exceptions.AuthenticationFailed("Invalid API key.")
        # One query: the key and its client together.
        api_key = ClientAPIKey.objects.get_usable_keys().select_related("client").filter(prefix=prefix).first()
        if api_key is None or api_key.has_expired or not api_key.is_valid(key):
            raise exceptions.AuthenticationFailed("Invalid API key.")
        return api_key.client, api_key

    def authenticate_header(self, request):
        return 'Bearer realm="payonce"'
