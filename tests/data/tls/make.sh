#!/usr/bin/env bash
# Test certificates for ferrisix's TLS tests, made once with openssl and committed (nothing
# remakes them per run). Validity 2025-01-01 to 2055-01-01, except expired-client (2020).
#   ca            RSA CA that signs the server certificates
#   server        CN server.local, SANs server.local, localhost, IP 127.0.0.1 (RSA)
#   wild          CN *.wild.local (RSA)
#   dual-rsa      CN dual.local, SANs dual.local, rsa.dual.local (RSA)
#   (dual-rsa.pub: dual-rsa's public key)
#   dual-ecdsa    CN dual.local, SANs dual.local, ecdsa.dual.local (EC P-256)
#   other         CN other.local (EC P-256)
#   client-ca     RSA CA that signs client certificates
#   client        CN client (clientAuth), signed by client-ca
#   expired-client  CN expired-client, signed by client-ca, valid 2020-01-01..2020-01-02
#   rogue         CN rogue, self-signed client certificate
#   client-v1     CN client-v1, signed by client-ca, X.509 v1 (no extensions)
set -euo pipefail
cd "$(dirname "$0")"
rm -rf .ca && mkdir .ca && touch .ca/index.txt && echo 1000 > .ca/serial
cat > .ca/ca.cnf <<CNF
[ ca ]
default_ca = d
[ d ]
database = .ca/index.txt
serial = .ca/serial
new_certs_dir = .ca
default_md = sha256
policy = p
unique_subject = no
copy_extensions = none
[ p ]
commonName = supplied
organizationName = optional
CNF
ext_ca='basicConstraints=critical,CA:TRUE
keyUsage=critical,keyCertSign,cRLSign
subjectKeyIdentifier=hash'
ext_server() { printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\nsubjectAltName=%s\n' "$1"; }
ext_client='basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid'
key() { if [ "$2" = ec ]; then openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"; else openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1.key"; fi; }
sign() { # name cn issuer ext start end
  openssl req -new -key "$1.key" -subj "/O=ferrisix-test/CN=$2" -out ".ca/$1.csr"
  printf '%s\n' "$4" > ".ca/$1.ext"
  if [ "$3" = self ]; then
    openssl ca -batch -config .ca/ca.cnf -selfsign -keyfile "$1.key" -notext -startdate "$5" -enddate "$6" -extfile ".ca/$1.ext" -in ".ca/$1.csr" -out "$1.crt" 2>/dev/null
  else
    openssl ca -batch -config .ca/ca.cnf -cert "$3.crt" -keyfile "$3.key" -notext -startdate "$5" -enddate "$6" -extfile ".ca/$1.ext" -in ".ca/$1.csr" -out "$1.crt" 2>/dev/null
  fi
}
S=20250101000000Z; E=20550101000000Z
key ca rsa; sign ca "ferrisix test CA" self "$ext_ca" $S $E
key client-ca rsa; sign client-ca "ferrisix test client CA" self "$ext_ca" $S $E
key server rsa; sign server server.local ca "$(ext_server DNS:server.local,DNS:localhost,IP:127.0.0.1)" $S $E
key wild rsa; sign wild "*.wild.local" ca "$(ext_server 'DNS:*.wild.local')" $S $E
key dual-rsa rsa; sign dual-rsa dual.local ca "$(ext_server DNS:dual.local,DNS:rsa.dual.local)" $S $E
key dual-ecdsa ec; sign dual-ecdsa dual.local ca "$(ext_server DNS:dual.local,DNS:ecdsa.dual.local)" $S $E
key other ec; sign other other.local ca "$(ext_server DNS:other.local)" $S $E
key client rsa; sign client client client-ca "$ext_client" $S $E
key expired-client rsa; sign expired-client expired-client client-ca "$ext_client" 20200101000000Z 20200102000000Z
key rogue rsa; sign rogue rogue self "$ext_client" $S $E
# Without -extfile openssl ca writes a version 1 certificate.
key client-v1 rsa
openssl req -new -key client-v1.key -subj "/O=ferrisix-test/CN=client-v1" -out .ca/client-v1.csr
openssl ca -batch -config .ca/ca.cnf -cert client-ca.crt -keyfile client-ca.key -notext -startdate $S -enddate $E -in .ca/client-v1.csr -out client-v1.crt 2>/dev/null
rm -rf .ca
# dual-rsa's public key on its own: google-cloud-logging's tests check the service-account JWT
# it signs with dual-rsa.key.
openssl rsa -in dual-rsa.key -pubout -out dual-rsa.pub 2>/dev/null
