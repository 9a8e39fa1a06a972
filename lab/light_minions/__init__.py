"""Light simulated Salt minions for the region-scale bench (lab only; nothing that ships imports
this): many minions in one process, each with its own id and pki_dir, authenticating to a real
salt-master with Salt's own classes (salt.crypt.AsyncAuth, salt.channel.client.AsyncReqChannel /
AsyncPubChannel), receiving every publication, and answering the calls the pipeline and
reconcile make with canned, well-formed returns through the request channel, as
uyuni-project/evil-minions does (this is a fresh implementation, not its code)."""
