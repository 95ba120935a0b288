"""Attachment stores: admission, the filesystem and S3 backends, the verified-object cache
(proxy layer). No aiohttp server code, no app state: they know bytes, ids and limits."""
