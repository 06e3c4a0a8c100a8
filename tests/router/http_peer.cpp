#include "http_peer.h"

namespace moeserve::router::testing {

std::string nginx_reference_config(const std::string& d, uint16_t port, const std::vector<std::string>& urls,
                                   bool least_conn) {
  std::string servers;
  for (const auto& url : urls) servers += "    server " + url.substr(7) + " max_fails=3 fail_timeout=30s;\n";
  return "worker_processes 1;\ndaemon off;\nmaster_process off;\npid " + d + "/nginx.pid;\nerror_log " + d +
         "/error.log warn;\nevents { worker_connections 4096; }\nhttp {\n  access_log off;\n"
         "  client_body_temp_path " +
         d + "/body;\n  proxy_temp_path " + d +
         "/proxy;\n"
         "  fastcgi_temp_path " +
         d + "/fastcgi;\n  uwsgi_temp_path " + d +
         "/uwsgi;\n"
         "  scgi_temp_path " +
         d +
         "/scgi;\n"
         "  upstream llm {\n" +
         (least_conn ? "    least_conn;\n" : "") + servers +
         "    keepalive 32;\n    keepalive_timeout 300s;\n  }\n"
         "  server {\n    listen 127.0.0.1:" +
         std::to_string(port) +
         ";\n    location / {\n"
         "      proxy_pass http://llm;\n      proxy_http_version 1.1;\n      proxy_set_header Connection "
         "\"\";\n"
         "      proxy_buffering off;\n      proxy_read_timeout 300s;\n      proxy_send_timeout 300s;\n"
         "    }\n  }\n}\n";
}

std::string sse_event(const std::string& content) {
  return "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" +
         content + "\"}}]}\n\n";
}

}  // namespace moeserve::router::testing
