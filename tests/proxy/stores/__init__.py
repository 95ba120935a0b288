"""The stores layer: admission, the verified-object cache, the filesystem and S3 stores and their contract."""
