"""`Authorization: Bearer <api_key>`: the key's prefix finds its row, the SHA-512 hash verifies it
(djangorestframework-api-key), and the request acts as that key's client."""

from django.db import connection
from django.utils import timezone
from rest_framework import authentication, exceptions

from accounts.models import Client, ClientAPIKey

_KEY_SQL = """
SELECT k.id, k.hashed_key, k.expiry_date, c.id, c.name, c.monthly_cap_usd, c.created_at, c.creates_per_s,
       c.create_burst
  FROM jobs_clientapikey k JOIN jobs_client c ON c.id = k.client_id
 WHERE k.prefix = %s AND NOT k.revoked
"""


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
        # One plain query, the key and its client together: it runs for every request.
        with connection.cursor() as cursor:
            cursor.execute(_KEY_SQL, [prefix])
            found = cursor.fetchone()
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid API key.")
        key_id, hashed_key, expiry_date, client_id, name, cap, created_at, creates_per_s, create_burst = found
        expired = expiry_date is not None and expiry_date < timezone.now()
        if expired or not ClientAPIKey.objects.key_generator.verify(key, hashed_key):
            raise exceptions.AuthenticationFailed("Invalid API key.")
        return Client(id=client_id, name=name, monthly_cap_usd=cap, created_at=created_at, creates_per_s=creates_per_s,
                      create_burst=create_burst), key_id

    def authenticate_header(self, request):
        return 'Bearer realm="payonce"'
