#!/bin/sh
exec java -Xmx512m -XX:TieredStopAtLevel=1 -Djava.security.egd=file:/dev/urandom \
  -cp /usr/share/puppetdb/puppetdb.jar clojure.main -m puppetlabs.puppetdb.core services \
  --config "/work/main/e2e/.state-ops/pdb-u/conf.d" --bootstrap-config /etc/puppetdb/bootstrap.cfg >>"/work/main/e2e/.state-ops/pdb-u/stdout.log" 2>&1 </dev/null
