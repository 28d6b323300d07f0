"""Identity for Electra: certificates, role credentials, TLS contexts and the audit log."""
