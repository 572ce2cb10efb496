#![allow(clippy::unwrap_used, clippy::panic)]

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use proptest::prelude::*;

use super::*;

fn name(n: &str) -> Name {
    let mut n = Name::from_ascii(n).unwrap();
    n.set_fqdn(true);
    n
}

/// A reply to query `id` for `asked`'s `kind` records with `answers`.
fn reply(
    id: u16,
    asked: &Name,
    kind: RecordType,
    code: ResponseCode,
    answers: Vec<Record>,
) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Response)
        .set_response_code(code)
        .add_query(Query::query(asked.clone(), kind));
    for a in answers {
        m.add_answer(a);
    }
    m.to_vec().unwrap()
}

fn a(owner: &Name, ip: [u8; 4]) -> Record {
    Record::from_rdata(owner.clone(), 60, RData::A(A::from(Ipv4Addr::from(ip))))
}

fn cname(owner: &Name, to: &Name) -> Record {
    Record::from_rdata(owner.clone(), 60, RData::CNAME(CNAME(to.clone())))
}

/// The hosts file and the resolver file are read as the host wrote them: comments, several
/// names per line, names without case; `nameserver` lines in order.
#[test]
fn the_host_files_give_their_addresses_and_nameservers() {
    let hosts = "127.0.0.1 localhost\n# 10.0.0.1 commented\n::1 ip6-localhost Localhost\n192.0.2.7 a.example b.example # trailing\nnot-an-address x.example\n";
    assert_eq!(
        from_hosts(hosts, "localhost"),
        [
            "127.0.0.1".parse::<IpAddr>().unwrap(),
            "::1".parse().unwrap()
        ]
    );
    assert_eq!(
        from_hosts(hosts, "B.EXAMPLE"),
        ["192.0.2.7".parse::<IpAddr>().unwrap()]
    );
    assert!(from_hosts(hosts, "commented").is_empty());
    assert!(from_hosts(hosts, "x.example").is_empty());
    // Options the C library knows and this lookup does not (glibc ignores them too), and a
    // link-local nameserver with a zone, take nothing away from the others.
    let conf = "search corp.example\noptions strict-error ndots:5\nnameserver 192.0.2.53\nnameserver fe80::1%eth0\n  nameserver   2001:db8::53\nnameserver\n";
    assert_eq!(
        nameservers(conf),
        [
            "192.0.2.53:53".parse::<SocketAddr>().unwrap(),
            "[2001:db8::53]:53".parse().unwrap()
        ]
    );
    assert!(nameservers("").is_empty());
}

/// An answer is taken only when it answers the question asked (id, name, kind); its addresses
/// are those of the name or of the end of its CNAME chain within the answer; a refusal, a
/// missing name, a truncated answer and an endless chain are reasons, never addresses.
#[test]
fn only_an_answer_to_the_question_asked_gives_addresses() {
    let asked = name("fetch.example");
    let alias = name("cdn.example");
    let other = name("other.example");
    let ok = |answers| reply(7, &asked, RecordType::A, ResponseCode::NoError, answers);
    assert_eq!(
        addresses(
            &ok(vec![a(&asked, [192, 0, 2, 1]), a(&other, [192, 0, 2, 9])]),
            &asked,
            RecordType::A,
            7
        ),
        Some(Ok(vec![IpAddr::from([192, 0, 2, 1])]))
    );
    assert_eq!(
        addresses(
            &ok(vec![cname(&asked, &alias), a(&alias, [192, 0, 2, 2])]),
            &asked,
            RecordType::A,
            7
        ),
        Some(Ok(vec![IpAddr::from([192, 0, 2, 2])]))
    );
    // Another id, another name, another kind: not ours.
    assert_eq!(
        addresses(
            &ok(vec![a(&asked, [192, 0, 2, 1])]),
            &asked,
            RecordType::A,
            8
        ),
        None
    );
    assert_eq!(
        addresses(
            &ok(vec![a(&asked, [192, 0, 2, 1])]),
            &other,
            RecordType::A,
            7
        ),
        None
    );
    assert_eq!(
        addresses(
            &ok(vec![a(&asked, [192, 0, 2, 1])]),
            &asked,
            RecordType::AAAA,
            7
        ),
        None
    );
    assert_eq!(
        addresses(b"\x00\x07garbage", &asked, RecordType::A, 7),
        None
    );
    // A query echoed back is not an answer.
    assert_eq!(
        addresses(
            &query(&asked, RecordType::A, 7).unwrap(),
            &asked,
            RecordType::A,
            7
        ),
        None
    );
    // Our question, unusable answers.
    for code in [
        ResponseCode::NXDomain,
        ResponseCode::ServFail,
        ResponseCode::Refused,
    ] {
        let r = reply(7, &asked, RecordType::A, code, vec![]);
        assert!(
            matches!(addresses(&r, &asked, RecordType::A, 7), Some(Err(_))),
            "{code}"
        );
    }
    let mut truncated = Message::from_vec(&ok(vec![a(&asked, [192, 0, 2, 1])])).unwrap();
    truncated.set_truncated(true);
    assert!(matches!(
        addresses(&truncated.to_vec().unwrap(), &asked, RecordType::A, 7),
        Some(Err(why)) if why.contains("truncated")
    ));
    // A chain that loops never ends in an address.
    assert!(matches!(
        addresses(&ok(vec![cname(&asked, &alias), cname(&alias, &asked)]), &asked, RecordType::A, 7),
        Some(Err(why)) if why.contains("CNAME chain")
    ));
    // An address of another kind than asked is not taken; a name with none has none.
    let v6 = Record::from_rdata(
        asked.clone(),
        60,
        RData::AAAA(AAAA::from(Ipv6Addr::LOCALHOST)),
    );
    assert_eq!(
        addresses(&ok(vec![v6]), &asked, RecordType::A, 7),
        Some(Ok(vec![]))
    );
    // Never more than MAX_ADDRESSES from one answer.
    let many = (0..200u8).map(|i| a(&asked, [192, 0, 2, i])).collect();
    assert_eq!(
        addresses(&ok(many), &asked, RecordType::A, 7)
            .unwrap()
            .unwrap()
            .len(),
        MAX_ADDRESSES
    );
}

proptest! {
    /// Hostile replies: any bytes, and a real answer with bytes changed, end in an answer, a
    /// reason or "not ours", within the bound, never a panic.
    #[test]
    fn any_reply_bytes_are_bounded_and_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
    ) {
        let asked = name("fetch.example");
        let _ = addresses(&bytes, &asked, RecordType::A, 7);
        let mut real = reply(
            7,
            &asked,
            RecordType::A,
            ResponseCode::NoError,
            vec![cname(&asked, &name("cdn.example")), a(&name("cdn.example"), [192, 0, 2, 2])],
        );
        for (at, b) in flips {
            let n = real.len();
            real[at % n] = b;
        }
        if let Some(Ok(found)) = addresses(&real, &asked, RecordType::A, 7) {
            prop_assert!(found.len() <= MAX_ADDRESSES);
        }
    }
}

/// The parent decodes only fixed-size address frames and the end: an address of another
/// size, one address past the bound, an unknown tag, a rejection (which a resolver child
/// never reports) and silence are each refused.
#[test]
fn the_parent_reads_only_bounded_address_frames_and_the_end() {
    let frames = |f: &[(u8, Vec<u8>)]| {
        let mut out = Vec::new();
        for (tag, payload) in f {
            write_frame(&mut out, *tag, payload).unwrap();
        }
        out
    };
    let end = |e: &End| (END, serde_json::to_vec(e).unwrap());
    let read = |bytes: Vec<u8>| read_answer(&mut FrameReader::new(bytes.as_slice(), 4096, 1 << 16));
    assert_eq!(
        read(frames(&[
            (ADDRESS, vec![192, 0, 2, 1]),
            (ADDRESS, vec![0; 16]),
            end(&End::Done)
        ])),
        Ok(Answer::Addresses(vec![
            IpAddr::from([192, 0, 2, 1]),
            IpAddr::from(Ipv6Addr::UNSPECIFIED)
        ]))
    );
    assert!(read(frames(&[(ADDRESS, vec![1, 2, 3, 4, 5]), end(&End::Done)])).is_err());
    let too_many: Vec<(u8, Vec<u8>)> = (0..=MAX_ADDRESSES)
        .map(|_| (ADDRESS, vec![192, 0, 2, 1]))
        .chain([end(&End::Done)])
        .collect();
    assert!(read(frames(&too_many)).is_err());
    assert!(read(frames(&[(b'X', vec![]), end(&End::Done)])).is_err());
    assert!(
        read(frames(&[end(&End::Rejected {
            code: "transport.too-big".into(),
            why: String::new()
        })]))
        .is_err()
    );
    assert!(read(frames(&[end(&End::Done)])).is_err());
    assert!(read(Vec::new()).is_err());
    assert_eq!(
        read(frames(&[end(&End::Failed {
            why: "\u{1b}[31mno".into()
        })])),
        Ok(Answer::Unanswered("\\u{1b}[31mno".into()))
    );
}
