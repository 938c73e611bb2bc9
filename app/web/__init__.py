"""The HTTP toolkit every blueprint uses: problems, request bodies, authentication, shared
fields and the OpenAPI document. It knows no resource."""
