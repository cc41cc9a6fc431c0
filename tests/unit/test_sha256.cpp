// SHA-256 against the NIST FIPS 180-4 example vectors, one-shot and streaming.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "compiler/support/sha256.hpp"

using attnjit::Sha256;
using attnjit::sha256_hex;

TEST_CASE("sha256 of the empty string", "[sha256]") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("sha256 of abc", "[sha256]") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("sha256 of the 448-bit two-block message", "[sha256]") {
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST_CASE("sha256 of one million 'a' streamed", "[sha256]") {
  Sha256 h;
  std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.update(chunk.data(), chunk.size());
  CHECK(h.hex_digest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256 digest bytes match the hex digest", "[sha256]") {
  Sha256 h;
  h.update("abc", 3);
  auto d = h.digest();
  CHECK(d[0] == 0xba);
  CHECK(d[31] == 0xad);
}

// A fixed 1000-byte pseudo-random message; reference digests from Python's hashlib.
static std::string test_message() {
  std::string message;
  for (int i = 0; i < 1000; ++i) message += static_cast<char>((i * 131 + 7) & 0xff);
  return message;
}

TEST_CASE("sha256 at the padding boundaries matches hashlib", "[sha256]") {
  std::string m = test_message();
  CHECK(sha256_hex(m.substr(0, 55)) == "16ed9c4697ca11d5f6fb25ea7900252dd4cb97215d7f6d0b2bb3e2a86ac0ec72");
  CHECK(sha256_hex(m.substr(0, 56)) == "939ada93b2fe1e9c596d767bb408567c83e253667f0b25e5be8e16f35f2cbac9");
  CHECK(sha256_hex(m.substr(0, 64)) == "b337ba9b0c69c391364e985fdcb23a889887e59800832c92fbfa22b8a3c40304");
  CHECK(sha256_hex(m.substr(0, 119)) == "9773fbac8194c3d789af101b49b6a26073076895ef6e0f658432849dd477a43f");
  CHECK(sha256_hex(m) == "533b698850849b7908b20a22658f639c0b2a476f1791f85f50188287c31a9aba");
}

TEST_CASE("sha256 streaming in odd-sized chunks equals one-shot", "[sha256]") {
  // Lengths around the 55/56/64-byte padding boundaries exercise every buffering path.
  std::string message = test_message();
  for (std::size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000}) {
    std::string part = message.substr(0, len);
    std::string expected = sha256_hex(part);
    for (std::size_t chunk : {1, 3, 7, 13, 63, 64, 65, 200}) {
      Sha256 h;
      for (std::size_t pos = 0; pos < part.size(); pos += chunk)
        h.update(part.data() + pos, std::min(chunk, part.size() - pos));
      INFO("length " << len << ", chunk " << chunk);
      CHECK(h.hex_digest() == expected);
    }
  }
}
